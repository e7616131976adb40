import sys

from sinklib.book.runner import main

sys.exit(main())
