"""Jinja filters of the monitoring roles (prometheus, slurm_exporter): the scrape targets, from the plan.

Pure functions (no Ansible imports), so that tests/unit can call them directly.
Found through `filter_plugins` in ansible/ansible.cfg (and next to the playbooks).

Every planned node is a target of each exporter it runs: static nodes always (one that does not
answer is a real problem), elastic nodes only while they are powered up, through a file the
Slurm exporter keeps (Prometheus's file-based service discovery): a powered-down node is no
error. GPU nodes are those of the `dcgm` feature group, without placeholder GPUs.
"""

ELASTIC = "clusterbake_elastic"


def monitoring_exporter_jobs(hostvars, groups, ports, node_exporter=True, dcgm_exporter=True, targets_dir=""):
    """Each node exporter's scrape job: [{job, port, static: [nodes], elastic: [nodes], file}], nodes in the
    inventory's order (heads, login nodes, then the node groups), `file` the elastic nodes' file_sd (None
    without any)."""
    nodes = [
        *groups.get("slurm_head", []),
        *groups.get("slurm_backup_head", []),
        *groups.get("slurm_login", []),
        *groups.get("slurm_compute", []),
    ]
    gpu = set(groups.get("dcgm", [])) - set(groups.get("placeholder_gpus", []))
    wanted = []
    if node_exporter:
        wanted.append(("node", int(ports["node_exporter"]), nodes))
    if dcgm_exporter:
        wanted.append(("dcgm", int(ports["dcgm_exporter"]), [n for n in nodes if n in gpu]))
    jobs = []
    for job, port, members in wanted:
        if not members:
            continue
        elastic = [n for n in members if hostvars.get(n, {}).get(ELASTIC)]
        jobs.append(
            {
                "job": job,
                "port": port,
                "static": [n for n in members if n not in elastic],
                "elastic": elastic,
                "file": f"{targets_dir}/{job}.json" if elastic else None,
            }
        )
    return jobs


def prometheus_config(jobs, cluster, ports, scrape_interval, head):
    """prometheus.yml: Prometheus itself and the Slurm exporter on the head (127.0.0.1: the exporter listens on
    IPv4, and `localhost` may be ::1), then each exporter job, the
    `node` label the node's name (its inventory name: /etc/hosts resolves it on the head)."""
    node_label = {"source_labels": ["__address__"], "regex": "([^:]+):\\d+", "target_label": "node"}
    configs = [
        {
            "job_name": "prometheus",
            "static_configs": [{"targets": [f"127.0.0.1:{ports['prometheus']}"], "labels": {"node": head}}],
        },
        # No `node` label on the target: the exporter's own `node` labels (slurm_node_state) name the nodes.
        {"job_name": "slurm", "static_configs": [{"targets": [f"127.0.0.1:{ports['slurm_exporter']}"]}]},
    ]
    for job in jobs:
        config = {"job_name": job["job"]}
        if job["static"]:
            config["static_configs"] = [{"targets": [f"{n}:{job['port']}" for n in job["static"]]}]
        if job["file"]:
            config["file_sd_configs"] = [{"files": [job["file"]], "refresh_interval": "30s"}]
        config["relabel_configs"] = [node_label]
        configs.append(config)
    interval = f"{int(scrape_interval)}s"
    return {
        "global": {
            "scrape_interval": interval,
            "evaluation_interval": interval,
            "external_labels": {"cluster": cluster},
        },
        "scrape_configs": configs,
    }


def slurm_exporter_targets(jobs):
    """The Slurm exporter's `targets`: for each job with elastic nodes, its file_sd file, port and nodes."""
    return [{"file": j["file"], "port": j["port"], "nodes": j["elastic"]} for j in jobs if j["file"]]


class FilterModule:
    def filters(self):
        return {
            "monitoring_exporter_jobs": monitoring_exporter_jobs,
            "prometheus_config": prometheus_config,
            "slurm_exporter_targets": slurm_exporter_targets,
        }
