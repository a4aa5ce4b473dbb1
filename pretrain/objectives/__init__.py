"""The training objectives as the trainer, its records, the plots, the export, the dry run and
the doctor ask them (:mod:`.registry`): one file per objective."""
