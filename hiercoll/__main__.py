import sys

from hiercoll.harness.startup import report_start_up_termination

report_start_up_termination()      # before the CLI's imports: a rank can be ended that early

from hiercoll.cli.main import main  # noqa: E402

sys.exit(main())
