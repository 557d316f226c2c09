"""Judges of an item's evidence, one module each: `facts` (the values they exchange),
`audit` (pure: the only way a verdict reaches the ledger), `llm` (the LLM judge), `rules`
(the rule judge), `commands` (the shell command runner), `index` (the op journal as the
rule judge keeps it), `evidence` (what the judges read in the store), `verdicts` (a
round judged) and `completion` (the completion check and how a task ends). `judges`
keeps the names of the module that held all three judges."""
