"""Gradient-bias studies of KL configurations: toy policies, exact enumeration, Monte Carlo."""
