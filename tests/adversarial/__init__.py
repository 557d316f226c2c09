"""Adversarial tests of honest completion: actors and judges that try to finish a task
the ledger does not support, one module per failure class."""
