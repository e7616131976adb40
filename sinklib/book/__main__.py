import sys

from sinklib.book.cli import main

sys.exit(main())
