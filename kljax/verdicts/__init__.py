"""What each configuration's gradient is: the verdicts of KL configurations and whole objectives, the
preset table, and other trainers' settings audited as kljax objectives."""
