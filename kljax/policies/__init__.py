"""Policies behind one protocol (`protocol.py`): the transformer (`transformer.py`) and a tabular
autoregressive policy that can be enumerated exactly (`tabular.py`); the rollout and the train step
talk to either through `as_policy`."""
