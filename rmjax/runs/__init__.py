"""A job's life on disk: claiming its output, resumable chunks, progress, results and their .meta.json."""
