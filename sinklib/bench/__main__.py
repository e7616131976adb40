import sys

from sinklib.bench.cpu import main

sys.exit(main())
