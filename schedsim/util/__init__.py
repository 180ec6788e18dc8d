"""Small helpers with no schedsim imports: atomic output files, GC control."""
