"""What a run reports: the results model and its codec, the terminal
summary, the JSON and HTML reports, memory_viz snapshots."""
