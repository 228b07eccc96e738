"""validate stage: predicted vs measured on the testbed."""
