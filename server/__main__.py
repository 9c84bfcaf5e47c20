import sys

from tessera.server.main import main

sys.exit(main())
