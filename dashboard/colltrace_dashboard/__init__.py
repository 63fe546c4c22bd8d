"""colltrace's live web dashboard (FastAPI + uvicorn), installed with `pip install 'colltrace[dashboard]'`.

    colltrace dashboard DIR | --store HOST:PORT        # a folder (live or post-mortem) or a running job
    COLLTRACE_DASHBOARD=[HOST:]PORT / colltrace run --dashboard [HOST:]PORT   # inside the leader watchdog

Modules: sources (where the data comes from), views (the page's model), metrics (Prometheus),
feed (the background refresh), app (routes and security), server (binding and threads).
"""
