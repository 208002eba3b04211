"""The collector configuration the official opentelemetry-collector chart (0.170.0) renders from
deploy/helm/'s values, reconstructed: the chart is in no registry reachable here, so its
rendering is rebuilt from what its templates do (read, not run), and written down here:

- the chart's default ``config`` (``CHART_CONFIG``) with the values' ``config`` merged into it
  as Helm merges values: maps key by key, a list replaces the default's, a null deletes the key;
- ``presets.kubernetesAttributes``: the ``k8s_attributes`` processor (its settings below; in a
  DaemonSet, only the pods of the agent's own node, ``K8S_NODE_NAME``), put first in every
  pipeline's processors, and the ClusterRole that lets it read pods, namespaces and ReplicaSets
  (``KUBERNETES_ATTRIBUTES_RULES``).

What this leaves out of the chart: the Kubernetes objects themselves (DaemonSet, Service,
ConfigMap), which the tests stand in for with processes on loopback (tests/e2e/bundle.py).
"""

from __future__ import annotations

import copy
from typing import Any

#: The chart's default ``config``: the components every rendered config starts from (a debug
#: exporter in each pipeline, the health check on the pod IP, the Collector's own metrics on the
#: pod IP's port 8888).
CHART_CONFIG: dict[str, Any] = {
    "exporters": {"debug": {}},
    "extensions": {"health_check": {"endpoint": "${env:MY_POD_IP}:13133"}},
    "processors": {
        "batch": {},
        "memory_limiter": {
            "check_interval": "5s",
            "limit_percentage": 80,
            "spike_limit_percentage": 25,
        },
    },
    "receivers": {
        "jaeger": {
            "protocols": {
                "grpc": {"endpoint": "${env:MY_POD_IP}:14250"},
                "thrift_http": {"endpoint": "${env:MY_POD_IP}:14268"},
                "thrift_compact": {"endpoint": "${env:MY_POD_IP}:6831"},
            }
        },
        "otlp": {
            "protocols": {
                "grpc": {"endpoint": "${env:MY_POD_IP}:4317"},
                "http": {"endpoint": "${env:MY_POD_IP}:4318"},
            }
        },
        "prometheus": {
            "config": {
                "scrape_configs": [
                    {
                        "job_name": "opentelemetry-collector",
                        "scrape_interval": "10s",
                        "static_configs": [{"targets": ["${env:MY_POD_IP}:8888"]}],
                    }
                ]
            }
        },
        "zipkin": {"endpoint": "${env:MY_POD_IP}:9411"},
    },
    "service": {
        "telemetry": {
            "metrics": {
                "readers": [
                    {
                        "pull": {
                            "exporter": {"prometheus": {"host": "${env:MY_POD_IP}", "port": 8888}}
                        }
                    }
                ]
            }
        },
        "extensions": ["health_check"],
        "pipelines": {
            "logs": {
                "exporters": ["debug"],
                "processors": ["memory_limiter", "batch"],
                "receivers": ["otlp"],
            },
            "metrics": {
                "exporters": ["debug"],
                "processors": ["memory_limiter", "batch"],
                "receivers": ["otlp", "prometheus"],
            },
            "traces": {
                "exporters": ["debug"],
                "processors": ["memory_limiter", "batch"],
                "receivers": ["otlp", "jaeger", "zipkin"],
            },
        },
    },
}

#: The preset's processor. ``passthrough: false``: the agent looks the pod up itself, by the
#: resource's k8s.pod.ip or k8s.pod.uid, else by the connection's source address.
KUBERNETES_ATTRIBUTES: dict[str, Any] = {
    "passthrough": False,
    "pod_association": [
        {"sources": [{"from": "resource_attribute", "name": "k8s.pod.ip"}]},
        {"sources": [{"from": "resource_attribute", "name": "k8s.pod.uid"}]},
        {"sources": [{"from": "connection"}]},
    ],
    "extract": {
        "metadata": [
            "k8s.namespace.name",
            "k8s.pod.name",
            "k8s.pod.uid",
            "k8s.node.name",
            "k8s.pod.start_time",
            "k8s.deployment.name",
            "k8s.replicaset.name",
            "k8s.replicaset.uid",
            "k8s.daemonset.name",
            "k8s.daemonset.uid",
            "k8s.job.name",
            "k8s.job.uid",
            "k8s.container.name",
            "k8s.cronjob.name",
            "k8s.statefulset.name",
            "k8s.statefulset.uid",
            "container.image.tag",
            "container.image.name",
        ]
    },
}

#: The chart's ClusterRole rules for the preset.
KUBERNETES_ATTRIBUTES_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["get", "watch", "list"]},
    {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["extensions"], "resources": ["replicasets"], "verbs": ["get", "list", "watch"]},
]


def merge(defaults: Any, values: Any) -> Any:
    """``values`` merged into ``defaults`` as Helm merges a values file into a chart's."""
    if not isinstance(defaults, dict) or not isinstance(values, dict):
        return copy.deepcopy(values)
    merged = copy.deepcopy(defaults)
    for key, value in values.items():
        if value is None:
            merged.pop(key, None)
        elif key in merged:
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = _without_nulls(value)
    return merged


def _without_nulls(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _without_nulls(value) for key, value in node.items() if value is not None}
    return copy.deepcopy(node)


def rendered_config(values: dict[str, Any]) -> dict[str, Any]:
    """The collector configuration the chart renders from ``values``."""
    config: dict[str, Any] = merge(CHART_CONFIG, values.get("config") or {})
    presets = values.get("presets") or {}
    if (presets.get("kubernetesAttributes") or {}).get("enabled"):
        processor = copy.deepcopy(KUBERNETES_ATTRIBUTES)
        if values.get("mode") == "daemonset":
            processor = {"filter": {"node_from_env_var": "K8S_NODE_NAME"}, **processor}
        config = merge({"processors": {"k8s_attributes": processor}}, config)
        for pipeline in config["service"]["pipelines"].values():
            processors = pipeline.get("processors") or []
            if "k8s_attributes" not in processors:
                pipeline["processors"] = ["k8s_attributes", *processors]
    return config
