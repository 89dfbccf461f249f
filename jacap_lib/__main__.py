"""``python -m jacap_lib <subcommand>`` = ``jacap <subcommand>`` (:mod:`jacap_lib.cli`)."""
import sys

from .cli import main

sys.exit(main())
