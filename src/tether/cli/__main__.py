"""`python -m tether.cli`."""

from tether.cli import main

main()
