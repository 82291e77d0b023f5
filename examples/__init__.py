"""Examples of a hashq app, run by docker-compose.yml's demo profile and the Docker image's
``example`` stage: ``videos`` is the handler, ``publish_uploads`` the publisher."""
