"""Statistics of a panel: Spearman, permutation nulls, intervals, LOPO (`panel`), the panel CSV schema
(`schema`), S beyond the QK-norm type (`architecture`), verdict rules and intervals (`verdicts`), tables as
shown (`display`)."""
