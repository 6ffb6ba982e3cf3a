"""Reports: the paper's transcribed numbers, statistics, and the tables and figures built from metrics."""
