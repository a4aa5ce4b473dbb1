"""A run folder (``--output_dir``): its layout, and its checkpoints read without changing them."""
