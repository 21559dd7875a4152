"""Reading users' node and edge tables (CSV, Parquet) in chunks, with errors that name file,
row and column (:mod:`.reading`), and the fitted feature, label and split transforms
(:mod:`.transforms`)."""
