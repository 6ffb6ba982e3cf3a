"""Evaluators, one small module each (big_vision style): top-1 classification, few-shot linear probe (the
sweeps': an ``Evaluator`` each, :mod:`.base`), zero-shot classification (LiT)."""
