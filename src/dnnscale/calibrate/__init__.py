"""calibrate stage."""
