"""What an evaluation trains and what it costs: the settings (declared once), the protocols,
sweep files, and the plan's cost and memory estimates, all before anything runs."""
