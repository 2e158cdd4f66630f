"""Slurm's power programs for elastic node groups, and the loop that keeps Slurm and the machines in step.

Installed in every image (role slurm_power); configured on the head, where slurmctld
runs it as SlurmUser. The name it is called by says what to do (slurm.conf(5)):

  clusterbake-resume HOSTLIST       ResumeProgram: power the nodes up (the jobs they are for,
                                    from SLURM_RESUME_FILE, are logged). A node that cannot
                                    be started is set DOWN with the cloud's error as the
                                    reason, so its job is requeued, not lost.
  clusterbake-suspend HOSTLIST      SuspendProgram: power the nodes down.
  clusterbake-resume-fail HOSTLIST  ResumeFailProgram: nodes that did not register within
                                    ResumeTimeout: power them off (nothing left running).
  clusterbake-wait-nodes            PrologSlurmctld: wait until the job's powered-up nodes
                                    registered, so the batch job starts at once. Without it
                                    slurmctld ends a job's CONFIGURING state only in its
                                    30 s periodic check (PERIODIC_TIMEOUT in Slurm 22.05 and
                                    23.11): a batch job would wait up to 30 s more.
                                    Always exits 0 (a failing prolog requeues the job).
  clusterbake-power reconcile       every reconcile_interval (clusterbake-power-reconcile.timer):
                                    a machine running behind a powered-down node is stopped
                                    after orphan_grace; a node left DOWN by a failed resume
                                    returns to service (idle~) after failed_node_cooldown; a
                                    static node whose machine is gone is set DOWN at once (its
                                    jobs requeued) and started again (replace_lost_nodes);
                                    aws: topology.conf rewritten where the running compute
                                    instances hang (module network), slurmctld reconfigured.

/etc/clusterbake/power.json says how nodes are powered:
  {"provider": "local", "agent": "unix:///run/clusterbake-power-agent/agent.sock", "token_file": "...", ...}
  local: the host-side power agent of the local provider (providers/local/power_agent.py), on its
  socket that only the head has.
  {"provider": "aws", "capacity_cooldown": 600, "aws": {"cluster", "region", "endpoint_url",
   "name_placeholder", "groups": {GROUP: {"launch_template": {"id", "version"},
   "instance_types": [...], "network_interfaces": {TYPE: [...]}, "user_data", "tags",
   "addresses": {NODE: ADDRESS}}}}, ...}
  aws: EC2 with the head's instance role (providers/aws/iam.py, `clusterbake-<cluster>-head`);
  with "topology_file" the reconcile loop keeps that topology.conf where EC2 places the running
  compute instances (module network).
  A node is one RunInstances from its group's launch template at its planned address;
  when EC2 has no capacity for a type (InsufficientInstanceCapacity, ...), the type is
  skipped for capacity_cooldown seconds (kept in the state file) and the next one is
  tried; powering down terminates the node's instance.
  {"provider": "azure", "capacity_cooldown": 600, "azure": {"arm_endpoint", "subscription_id",
   "resource_group", "cluster", "identity_client_id", "name_placeholder", "api_versions",
   "groups": {GROUP: {"sizes": [...], "nic": {NIC body}, "vm": {VM body}, "user_data",
   "addresses": {NODE: ADDRESS}}}}, ...}
  azure: ARM's REST API with a token of the head's user-assigned identity from IMDS
  (providers/azure/power.py, role `clusterbake-<cluster>-power-...`). A node is its NIC
  `<cluster>-<node>-nic` at its planned address, then its VM `<cluster>-<node>` of the
  group's first size with capacity (bodies from the provider, the node's name, size and user
  data filled in); a capacity error (AllocationFailed, SkuNotAvailable, quota, ...) deletes
  what the attempt made, cools the size down and tries the next; powering down deletes the
  VM (its NIC and OS disk go with it).
Every action is logged with its reason (journal and /var/log/clusterbake/power.log).
Standard library only; the aws backend imports boto3 (python3-boto3) when it runs.

Modules: core (the state file, the log, scontrol), cloud (what the cloud backends share: one
launch loop over a group's types, the capacity cool-down), local, aws, azure (the backends),
network (topology.conf from EC2's instance topology), topology (the controller's own
clusterbake.topology, installed from it), commands (the programs Slurm calls, and main). The
entry point is ../clusterbake-power.
"""
