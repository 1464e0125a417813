"""The BCP gateway: the only peer that reads raw Bandwidth-Constrained Protocol traffic.

It enforces channels, categories, bandwidth budgets, taint and human approval, and hands a
controller only validated, normalized answers. The pure parts do no I/O:

- :mod:`peers.gateway.bits`: what a spec costs in bits;
- :mod:`peers.gateway.normalize`: the canonical form of text answers;
- :mod:`peers.gateway.screening`: anomaly screening of text answers, with its rules in
  :mod:`peers.gateway.patterns`, the folding of disguised words in :mod:`peers.gateway.folding`
  and the prompt-vocabulary count in :mod:`peers.gateway.cues`;
- :mod:`peers.gateway.validation`: the verdict on an answer;
- :mod:`peers.gateway.screeners`: screener peers' requests and verdicts, combined with it;
- :mod:`peers.gateway.state`: budgets, task escalation, push rate limits, decided approvals.

The peer is :class:`peers.gateway.gateway.Gateway`; :mod:`peers.gateway.restore` rebuilds its
state from the activity log, :mod:`peers.gateway.runner` starts it beside a bus or alone.
"""

__all__: list[str] = []
