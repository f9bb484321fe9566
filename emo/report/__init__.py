"""What a reader sees of a sweep: the comparison table, its scoring rule and the plots."""
