"""Jobs: training, validation and averaging run in worker processes whose spec, status,
events and log live on disk under ``<root>/.nitro/jobs/<job_id>/``, so a job survives its
client's disconnect and the server's restart."""

from nitro_core.jobs.files import JobKind, JobSpec, JobState, JobStatus
from nitro_core.jobs.manager import JobManager

__all__ = ["JobKind", "JobManager", "JobSpec", "JobState", "JobStatus"]
