"""`python -m geniex` entry point."""
import sys

from geniex.cli import main

sys.exit(main())
