"""Development helpers outside the product: the demo (`orbit demo`) and the history generator
(`orbit dev seed-history`, tests and benchmarks)."""
