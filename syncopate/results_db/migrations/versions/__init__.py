"""Migration scripts, one per schema revision (see :data:`syncopate.results_db.schema.REVISIONS`)."""
