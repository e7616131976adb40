from sinklib.claims.table import main

raise SystemExit(main())
