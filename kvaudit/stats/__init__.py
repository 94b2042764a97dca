"""Statistics every stage shares: intervals, tests, leak statistics, each with its simulated operating characteristic."""
