"""``python -m sara_cli ...``: the same as ``sara ...``."""

from .main import main

main()
