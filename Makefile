.PHONY: default style types tests coverage bench

default: style types tests

style:
	ruff format --check .
	ruff check .

types:
	mypy bus peers schemas

tests:
	pytest

coverage:
	pytest --cov --cov-report=term-missing

bench:
	python -m bench all
