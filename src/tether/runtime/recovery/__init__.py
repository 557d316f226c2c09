"""Recovery at a turn's start: ops in doubt, evidence and deliverables checked again."""
