"""Judges of an item's evidence: the pure audit, the LLM judge, the rule judge, the
completion check."""
