"""``python -m kbroker.cli`` runs ``kctl``."""

from kbroker.cli.main import main

raise SystemExit(main())
