"""What the scheduler says each job holds (``allocation``: the types every source gives):
Slurm's prolog and epilog files (``slurm``, ``slurm_facts``) and the kubelet's pod resources
(``kubelet``, over ``producers/podresources_v1``)."""
