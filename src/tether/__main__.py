"""`python -m tether`: the `tether` command (as `python -m tether.cli`)."""

from tether.cli import main

main()
