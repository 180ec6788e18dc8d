"""Small helpers below the program layer (no schedsim imports but :mod:`schedsim.errors`):
atomic output files and the paths of one command (``files``), the one door input files
are read through (``inputs``), up-front work limits (``limits``), SIGTERM/SIGHUP as an
exception (``signals``), user text in messages and figures (``text``), a time and its unit as text
(``units``), GC control (``gc``)."""
