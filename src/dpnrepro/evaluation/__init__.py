"""Evaluators, one small module each (big_vision style): top-1 classification, few-shot linear probe."""
