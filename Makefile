.PHONY: default style types tests coverage bench compiled tests-compiled clean-compiled

default: style types tests

style:
	ruff format --check .
	ruff check .

types:
	mypy bus peers schemas

# Two processes, whole files each (README's Development): the suite mostly waits on subprocesses.
PYTEST_PARALLEL = -n 2 --dist loadfile

tests:
	pytest $(PYTEST_PARALLEL)

# The compiled build (setup.py): the modules of bus/compiled.py compiled by mypyc, in place, so
# that Python imports them instead of their .py; `make clean-compiled` goes back to pure Python.
compiled:
	BCPBUS_COMPILE=1 python setup.py -q build_ext --inplace

# On the compiled build: the suites of the compiled modules and the wire suites that drive them.
COMPILED_SUITES = tests/test_compiled.py tests/bus/test_protocol.py tests/bus/test_topics.py \
	tests/bus/test_router.py tests/bus/test_pushes.py tests/bus/test_policy.py \
	tests/bus/test_server_fast_path.py tests/bus/test_server.py tests/bus/test_local.py \
	tests/bus/test_fuzz.py tests/peers/gateway/test_validation.py tests/peers/gateway/test_bits.py \
	tests/peers/gateway/test_normalize.py tests/peers/gateway/test_screening.py \
	tests/peers/gateway/test_core.py tests/peers/gateway/test_sealed.py tests/peers/test_bcp.py \
	tests/peers/test_client.py

# An in-place build's shared mypyc runtime (*__mypyc.*.so) sits at the checkout's top, which an
# editable install does not put on sys.path: commands run from other folders need it there.
tests-compiled: compiled
	BCPBUS_EXPECT_COMPILED=1 PYTHONPATH=$(CURDIR) pytest $(PYTEST_PARALLEL) $(COMPILED_SUITES)

clean-compiled:
	rm -rf build
	rm -f *__mypyc.*.so bus/*.so bus/*/*.so peers/*.so peers/*/*.so

coverage:
	pytest --cov --cov-report=term-missing

bench:
	python -m bench all
