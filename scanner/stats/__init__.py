"""Pure statistics: matchings, independence statistics and their p-values, all on arrays, no I/O."""
