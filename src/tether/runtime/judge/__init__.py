"""Judges of an item's evidence, one module each: `facts` (the values they exchange),
`audit` (pure: the only way a verdict reaches the ledger), `llm` (the LLM judge), `rules`
(the rule judge, a package with what it needs: `commands` the shell command runner,
`scope` which items it checks, `index` the op journal as it keeps it, `evidence` what
it reads in the store), `verdicts` (a round judged) and `completion` (the completion
check and how a task ends). `judges` gathers their public names in one place."""
