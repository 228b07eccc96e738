"""runtime stage."""
