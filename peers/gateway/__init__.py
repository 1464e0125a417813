"""The BCP gateway: the only peer that reads raw Bandwidth-Constrained Protocol traffic.

It enforces channels, categories, bandwidth budgets, taint and human approval, and hands a
controller only validated, normalized answers. The pure parts live in submodules that do no I/O:

- :mod:`peers.gateway.bits`: what a spec costs in bits;
- :mod:`peers.gateway.normalize`: the canonical form of text answers;
- :mod:`peers.gateway.screening`: anomaly screening of text answers;
- :mod:`peers.gateway.validation`: the verdict on an answer.
"""
