import sys

from hiercoll.cli.main import main

sys.exit(main())
