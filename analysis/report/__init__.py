"""What a run's numbers are shown as: the summary, the diff of two runs, the HTML report
(its sections, plots, timeline and flame graphs)."""
