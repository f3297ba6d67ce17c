"""Reports and analysis over run folders: tables, plots, the page, row investigation, run comparison."""
