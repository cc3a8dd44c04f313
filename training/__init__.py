"""Training: embedded and user data sets, the masking schedule, the single objective, trainers."""
