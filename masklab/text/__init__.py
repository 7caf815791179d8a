"""Text handling: documents as units, the one selection rule, the query, reading user inputs."""
