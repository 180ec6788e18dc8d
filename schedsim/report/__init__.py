"""What schedsim tells a user beside the numbers: cost warnings and deadlock fixes
(:mod:`schedsim.report.advice`), and the self-contained interactive HTML report
(:mod:`schedsim.report.html`, needs bokeh: the ``report`` extra)."""
