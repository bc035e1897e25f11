//! The `meta.k8s.io` Table rendering of node and pod metrics, as metrics-server answers
//! `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` (what `kubectl get nodemetrics`
//! asks for).
//!
//! # Behaviour reproduced
//!
//! From metrics-server `pkg/api/table.go` (`addNodeMetricsToTable`, `addPodMetricsToTable`)
//! and `ConvertToTable` in `pkg/api/node.go` / `pkg/api/pod.go`:
//!
//! * Columns: `Name` (`type: string`, `format: name`, `description: "Name of the resource"`),
//!   then one column per usage resource in sorted order (`cpu`, `memory`, and `swap` when
//!   the first row has it; `type: string`,
//!   `format: quantity`), then `Window` (`type: string`, `format: duration`). Empty
//!   descriptions and zero priorities are written out (`"description":"","priority":0`).
//! * Cells are strings: the object name, the canonical quantities, and the window as Go's
//!   `Duration.String()`. A pod's quantities are the sums over its containers.
//! * The columns come from the first row whose usage has any resource. A pod with no
//!   containers has none, so until such a pod appears the columns are only `Name` and
//!   `Window` (recomputed per row) and its row has two cells; later rows always have one cell
//!   per column, `"0"` where a resource is missing.
//! * No rows (an empty list) gives `"columnDefinitions":null,"rows":null`, as Go's nil slices.
//! * Table `metadata` copies `resourceVersion`, `selfLink` (and, for lists, `continue`) from
//!   the source; metrics-server leaves those empty, so it is `{}`.
//!
//! From `k8s.io/apiserver` `pkg/endpoints/handlers/response.go` (`asTable`) and
//! `ValidateTableOptions`: `includeObject` `Metadata` (the default, also for `""`) embeds each
//! row's object as a `PartialObjectMetadata` of the Table's group version, carrying the whole
//! `metadata`; `Object` embeds the full object in the request's metrics version; `None`
//! writes `"object":null`. Other values are a 400 ([`IncludeObject::from_query`]).
//!
//! metrics-server supports no watch, so the watch-only `NoHeaders` option does not appear.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};

use crate::api::types::{
    MetricsVersion, NodeMetrics, NodeMetricsList, PodMetrics, PodMetricsList, Usage,
};
use crate::go;
use crate::json::{GoListMeta, GoObjectMeta};
use crate::quantity::Quantity;
use crate::status::Status;

/// The group version of the Table itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TableVersion {
    /// `meta.k8s.io/v1` (`v=v1;g=meta.k8s.io`): what current kubectl asks for.
    #[default]
    V1,
    /// `meta.k8s.io/v1beta1` (`v=v1beta1;g=meta.k8s.io`): same shape, older clients.
    V1beta1,
}

impl TableVersion {
    /// `"meta.k8s.io/v1"` or `"meta.k8s.io/v1beta1"`.
    pub fn api_version(self) -> &'static str {
        match self {
            Self::V1 => "meta.k8s.io/v1",
            Self::V1beta1 => "meta.k8s.io/v1beta1",
        }
    }
}

/// The `includeObject` table option: what each row's `object` holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IncludeObject {
    /// `None`: `"object":null`.
    None,
    /// `Metadata` (default): a `PartialObjectMetadata` with the object's full metadata.
    #[default]
    Metadata,
    /// `Object`: the whole object, with `kind` and `apiVersion`.
    Object,
}

impl IncludeObject {
    /// Parses the `includeObject` query parameter (absent or empty means `Metadata`),
    /// rejecting other values with the apiserver's 400 body.
    ///
    /// # Errors
    ///
    /// [`Status::invalid_include_object`] for anything but `""`, `Metadata`, `None`, `Object`.
    pub fn from_query(value: Option<&str>) -> Result<Self, Status> {
        match value.unwrap_or("") {
            "" | "Metadata" => Ok(Self::Metadata),
            "None" => Ok(Self::None),
            "Object" => Ok(Self::Object),
            other => Err(Status::invalid_include_object(other)),
        }
    }
}

/// How to render a Table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TableOptions {
    /// The Table's group version, from the `Accept` header.
    pub version: TableVersion,
    /// The `includeObject` query parameter.
    pub include_object: IncludeObject,
    /// The metrics version of the request, used for [`IncludeObject::Object`].
    pub metrics_version: MetricsVersion,
}

/// `metav1.TableColumnDefinition`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TableColumnDefinition {
    /// Column header.
    pub name: String,
    /// OpenAPI type (`string`).
    #[serde(rename = "type")]
    pub type_: String,
    /// OpenAPI format (`name`, `quantity`, `duration`).
    pub format: String,
    /// Human-readable description; written even when empty.
    pub description: String,
    /// Importance; 0 for every metrics-server column.
    pub priority: i32,
}

impl TableColumnDefinition {
    fn string(name: &str, format: &str, description: &str) -> Self {
        Self {
            name: name.to_owned(),
            type_: "string".to_owned(),
            format: format.to_owned(),
            description: description.to_owned(),
            priority: 0,
        }
    }
}

/// What a row's `object` field holds.
#[derive(Clone, Debug, PartialEq)]
pub enum RowObject {
    /// `includeObject=None`: `null`.
    None,
    /// `includeObject=Metadata`: `{"kind":"PartialObjectMetadata","apiVersion":…,
    /// "metadata":{…}}`.
    PartialObjectMetadata {
        /// The Table's group version, which the partial object shares.
        version: TableVersion,
        /// The object's metadata, whole.
        metadata: Box<ObjectMeta>,
    },
    /// `includeObject=Object` for a node.
    NodeMetrics(Box<NodeMetrics>),
    /// `includeObject=Object` for a pod.
    PodMetrics(Box<PodMetrics>),
}

impl Serialize for RowObject {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::None => serializer.serialize_none(),
            Self::PartialObjectMetadata { version, metadata } => {
                let mut state = serializer.serialize_struct("PartialObjectMetadata", 3)?;
                state.serialize_field("kind", "PartialObjectMetadata")?;
                state.serialize_field("apiVersion", version.api_version())?;
                state.serialize_field("metadata", &GoObjectMeta(metadata))?;
                state.end()
            }
            Self::NodeMetrics(node) => node.serialize(serializer),
            Self::PodMetrics(pod) => pod.serialize(serializer),
        }
    }
}

/// `metav1.TableRow`: `cells`, then `object` (row `conditions` are never set).
#[derive(Clone, Debug, PartialEq)]
pub struct TableRow {
    /// One string per column (see the module docs for the pod exception).
    pub cells: Vec<String>,
    /// The embedded object.
    pub object: RowObject,
}

impl Serialize for TableRow {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut state = serializer.serialize_struct("TableRow", 2)?;
        state.serialize_field("cells", &self.cells)?;
        state.serialize_field("object", &self.object)?;
        state.end()
    }
}

/// `metav1.Table`: `kind`, `apiVersion`, `metadata`, `columnDefinitions`, `rows`.
///
/// `None` column definitions or rows are written as `null`, like Go's nil slices.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// The Table's group version.
    pub version: TableVersion,
    /// List metadata (`{}` for metrics-server).
    pub metadata: ListMeta,
    /// The columns, or `None` when there are no rows.
    pub column_definitions: Option<Vec<TableColumnDefinition>>,
    /// The rows, or `None` when there are none.
    pub rows: Option<Vec<TableRow>>,
}

impl Serialize for Table {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut state = serializer.serialize_struct("Table", 5)?;
        state.serialize_field("kind", "Table")?;
        state.serialize_field("apiVersion", self.version.api_version())?;
        state.serialize_field("metadata", &GoListMeta(&self.metadata))?;
        state.serialize_field("columnDefinitions", &self.column_definitions)?;
        state.serialize_field("rows", &self.rows)?;
        state.end()
    }
}

impl Table {
    fn empty(version: TableVersion, metadata: ListMeta) -> Self {
        Self {
            version,
            metadata,
            column_definitions: None,
            rows: None,
        }
    }
}

/// The Table for a `NodeMetricsList`.
pub fn node_metrics_list_table(list: &NodeMetricsList, options: &TableOptions) -> Table {
    node_rows(list_table_meta(&list.metadata), &list.items, options)
}

/// The Table for a single `NodeMetrics` (a `GET` by name).
pub fn node_metrics_table(node: &NodeMetrics, options: &TableOptions) -> Table {
    node_rows(
        object_table_meta(&node.metadata),
        std::slice::from_ref(node),
        options,
    )
}

/// The Table for a `PodMetricsList`.
pub fn pod_metrics_list_table(list: &PodMetricsList, options: &TableOptions) -> Table {
    pod_rows(list_table_meta(&list.metadata), &list.items, options)
}

/// The Table for a single `PodMetrics` (a `GET` by name).
pub fn pod_metrics_table(pod: &PodMetrics, options: &TableOptions) -> Table {
    pod_rows(
        object_table_meta(&pod.metadata),
        std::slice::from_ref(pod),
        options,
    )
}

fn list_table_meta(list: &ListMeta) -> ListMeta {
    ListMeta {
        resource_version: list.resource_version.clone(),
        self_link: list.self_link.clone(),
        continue_: list.continue_.clone(),
        ..ListMeta::default()
    }
}

fn object_table_meta(object: &ObjectMeta) -> ListMeta {
    ListMeta {
        resource_version: object.resource_version.clone(),
        self_link: object.self_link.clone(),
        ..ListMeta::default()
    }
}

/// `Name`, one quantity column per resource name, `Window`.
fn columns(names: &[&str]) -> Vec<TableColumnDefinition> {
    let mut columns = Vec::with_capacity(names.len() + 2);
    columns.push(TableColumnDefinition::string(
        "Name",
        "name",
        "Name of the resource",
    ));
    for name in names {
        columns.push(TableColumnDefinition::string(name, "quantity", ""));
    }
    columns.push(TableColumnDefinition::string("Window", "duration", ""));
    columns
}

fn row_object(
    metadata: &ObjectMeta,
    options: &TableOptions,
    full: impl FnOnce() -> RowObject,
) -> RowObject {
    match options.include_object {
        IncludeObject::None => RowObject::None,
        IncludeObject::Metadata => RowObject::PartialObjectMetadata {
            version: options.version,
            metadata: Box::new(metadata.clone()),
        },
        IncludeObject::Object => full(),
    }
}

fn node_rows(metadata: ListMeta, nodes: &[NodeMetrics], options: &TableOptions) -> Table {
    let mut table = Table::empty(options.version, metadata);
    let mut rows = Vec::with_capacity(nodes.len());
    let mut names: Option<Vec<&'static str>> = None;
    for node in nodes {
        let names = names.get_or_insert_with(|| {
            let found: Vec<&'static str> = node.usage.entries().map(|(name, _)| name).collect();
            table.column_definitions = Some(columns(&found));
            found
        });
        let mut cells = Vec::with_capacity(names.len() + 2);
        cells.push(node.metadata.name.clone().unwrap_or_default());
        // By the first node's columns (`swap` on a node without swap, after one with it:
        // Go's zero quantity).
        cells.extend(names.iter().map(|name| cell(node.usage.entries(), name)));
        cells.push(go::format_duration(go::nanos(node.window)));
        rows.push(TableRow {
            cells,
            object: row_object(&node.metadata, options, || {
                RowObject::NodeMetrics(Box::new(node.clone().versioned(options.metrics_version)))
            }),
        });
    }
    if !rows.is_empty() {
        table.rows = Some(rows);
    }
    table
}

/// The cell of resource `name` in a row with these usage pairs: Go's `usage[name].String()`,
/// the zero quantity where the row lacks it.
fn cell(mut usage: impl Iterator<Item = (&'static str, Quantity)>, name: &str) -> String {
    usage.find(|(have, _)| *have == name).map_or_else(
        || Quantity::zero().canonical(),
        |(_, value)| value.canonical(),
    )
}

/// Sums a pod's container usage per resource, as Go's `Quantity.Add` does, in name order.
fn pod_usage(pod: &PodMetrics) -> Vec<(&'static str, Quantity)> {
    let mut sums: Vec<(&'static str, Quantity)> = Vec::new();
    for container in &pod.containers {
        for (name, value) in Usage::entries(&container.usage) {
            match sums.iter_mut().find(|(have, _)| *have == name) {
                Some((_, sum)) => sum.add(&value),
                None => {
                    let mut sum = Quantity::zero();
                    sum.add(&value);
                    sums.push((name, sum));
                }
            }
        }
    }
    sums.sort_by(|a, b| a.0.cmp(b.0));
    sums
}

fn pod_rows(metadata: ListMeta, pods: &[PodMetrics], options: &TableOptions) -> Table {
    let mut table = Table::empty(options.version, metadata);
    let mut rows = Vec::with_capacity(pods.len());
    // Go keeps `names` nil, and recomputes the columns, until a pod has any usage.
    let mut names: Option<Vec<&'static str>> = None;
    for pod in pods {
        let usage = pod_usage(pod);
        if names.is_none() {
            let found: Vec<&'static str> = usage.iter().map(|(name, _)| *name).collect();
            table.column_definitions = Some(columns(&found));
            if !found.is_empty() {
                names = Some(found);
            }
        }
        let row_names = names.as_deref().unwrap_or_default();
        let mut cells = Vec::with_capacity(row_names.len() + 2);
        cells.push(pod.metadata.name.clone().unwrap_or_default());
        cells.extend(
            row_names
                .iter()
                .map(|name| cell(usage.iter().copied(), name)),
        );
        cells.push(go::format_duration(go::nanos(pod.window)));
        rows.push(TableRow {
            cells,
            object: row_object(&pod.metadata, options, || {
                RowObject::PodMetrics(Box::new(pod.clone().versioned(options.metrics_version)))
            }),
        });
    }
    if !rows.is_empty() {
        table.rows = Some(rows);
    }
    table
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::*;
    use crate::api::types::ContainerMetrics;
    use crate::json::{encode_json, encode_json_pretty};

    const MI: u64 = 1 << 20;

    fn ts() -> SystemTime {
        UNIX_EPOCH + Duration::new(1_700_000_000, 987_654_321)
    }

    fn created() -> SystemTime {
        UNIX_EPOCH + Duration::new(1_700_000_042, 5)
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn json<T: Serialize + ?Sized>(value: &T) -> String {
        match encode_json(value).map(String::from_utf8) {
            Ok(Ok(text)) => text,
            other => panic!("encode failed: {other:?}"),
        }
    }

    const COLUMNS: &str = concat!(
        r#""columnDefinitions":["#,
        r#"{"name":"Name","type":"string","format":"name","description":"Name of the resource","priority":0},"#,
        r#"{"name":"cpu","type":"string","format":"quantity","description":"","priority":0},"#,
        r#"{"name":"memory","type":"string","format":"quantity","description":"","priority":0},"#,
        r#"{"name":"Window","type":"string","format":"duration","description":"","priority":0}],"#,
    );

    fn nodes() -> NodeMetricsList {
        NodeMetricsList::new(
            MetricsVersion::V1beta1,
            vec![
                NodeMetrics::new(
                    "node1",
                    labels(&[("kubernetes.io/hostname", "node1")]),
                    created(),
                    ts(),
                    Duration::from_nanos(1_000),
                    10_000_000,
                    5 * MI,
                ),
                NodeMetrics::new(
                    "node2",
                    BTreeMap::new(),
                    created(),
                    ts(),
                    Duration::from_millis(20_051),
                    1_000_000_000,
                    1_000,
                ),
            ],
        )
    }

    fn pods() -> PodMetricsList {
        PodMetricsList::new(
            MetricsVersion::V1beta1,
            vec![
                PodMetrics::new(
                    "default",
                    "pod1",
                    labels(&[("app", "web")]),
                    created(),
                    ts(),
                    Duration::from_secs(15),
                    vec![ContainerMetrics::new("c1", 10_000_000, 5 * MI)],
                ),
                PodMetrics::new(
                    "default",
                    "pod2",
                    BTreeMap::new(),
                    created(),
                    ts(),
                    Duration::from_millis(60_500),
                    vec![
                        ContainerMetrics::new("c1", 10_000_000, 5 * MI),
                        ContainerMetrics::new("c2", 10_000_000, 10 * MI),
                    ],
                ),
            ],
        )
    }

    #[test]
    fn node_list_table_with_partial_metadata() {
        let table = node_metrics_list_table(&nodes(), &TableOptions::default());
        let want = [
            r#"{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{},"#,
            COLUMNS,
            r#""rows":["#,
            r#"{"cells":["node1","10m","5Mi","1µs"],"#,
            r#""object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","#,
            r#""metadata":{"name":"node1","creationTimestamp":"2023-11-14T22:14:02Z","#,
            r#""labels":{"kubernetes.io/hostname":"node1"}}}},"#,
            r#"{"cells":["node2","1","1k","20.051s"],"#,
            r#""object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","#,
            r#""metadata":{"name":"node2","creationTimestamp":"2023-11-14T22:14:02Z"}}}"#,
            "]}\n",
        ]
        .concat();
        assert_eq!(json(&table), want);
    }

    #[test]
    fn pod_list_table_sums_containers() {
        let table = pod_metrics_list_table(&pods(), &TableOptions::default());
        let want = [
            r#"{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{},"#,
            COLUMNS,
            r#""rows":["#,
            r#"{"cells":["pod1","10m","5Mi","15s"],"#,
            r#""object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","#,
            r#""metadata":{"name":"pod1","namespace":"default","#,
            r#""creationTimestamp":"2023-11-14T22:14:02Z","labels":{"app":"web"}}}},"#,
            r#"{"cells":["pod2","20m","15Mi","1m0.5s"],"#,
            r#""object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","#,
            r#""metadata":{"name":"pod2","namespace":"default","#,
            r#""creationTimestamp":"2023-11-14T22:14:02Z"}}}"#,
            "]}\n",
        ]
        .concat();
        assert_eq!(json(&table), want);
    }

    #[test]
    fn single_object_tables() {
        let options = TableOptions {
            version: TableVersion::V1beta1,
            include_object: IncludeObject::None,
            metrics_version: MetricsVersion::V1beta1,
        };
        let node = nodes().items.remove(1);
        let want = [
            r#"{"kind":"Table","apiVersion":"meta.k8s.io/v1beta1","metadata":{},"#,
            COLUMNS,
            r#""rows":[{"cells":["node2","1","1k","20.051s"],"object":null}]}"#,
            "\n",
        ]
        .concat();
        assert_eq!(json(&node_metrics_table(&node, &options)), want);

        let pod = pods().items.remove(0);
        let want = [
            r#"{"kind":"Table","apiVersion":"meta.k8s.io/v1beta1","metadata":{},"#,
            COLUMNS,
            r#""rows":[{"cells":["pod1","10m","5Mi","15s"],"object":null}]}"#,
            "\n",
        ]
        .concat();
        assert_eq!(json(&pod_metrics_table(&pod, &options)), want);
    }

    #[test]
    fn include_object_embeds_full_objects() {
        let options = TableOptions {
            include_object: IncludeObject::Object,
            ..TableOptions::default()
        };
        let mut list = nodes();
        list.items.truncate(1);
        let want = [
            r#"{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{},"#,
            COLUMNS,
            r#""rows":[{"cells":["node1","10m","5Mi","1µs"],"#,
            r#""object":{"kind":"NodeMetrics","apiVersion":"metrics.k8s.io/v1beta1","#,
            r#""metadata":{"name":"node1","creationTimestamp":"2023-11-14T22:14:02Z","#,
            r#""labels":{"kubernetes.io/hostname":"node1"}},"#,
            r#""timestamp":"2023-11-14T22:13:20Z","window":"1µs","#,
            r#""usage":{"cpu":"10m","memory":"5Mi"}}}]}"#,
            "\n",
        ]
        .concat();
        assert_eq!(json(&node_metrics_list_table(&list, &options)), want);

        let options = TableOptions {
            include_object: IncludeObject::Object,
            metrics_version: MetricsVersion::V1,
            ..TableOptions::default()
        };
        let mut list = pods();
        list.items.truncate(1);
        let want = [
            r#"{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{},"#,
            COLUMNS,
            r#""rows":[{"cells":["pod1","10m","5Mi","15s"],"#,
            r#""object":{"kind":"PodMetrics","apiVersion":"metrics.k8s.io/v1","#,
            r#""metadata":{"name":"pod1","namespace":"default","#,
            r#""creationTimestamp":"2023-11-14T22:14:02Z","labels":{"app":"web"}},"#,
            r#""timestamp":"2023-11-14T22:13:20Z","window":"15s","#,
            r#""containers":[{"name":"c1","usage":{"cpu":"10m","memory":"5Mi"}}]}}]}"#,
            "\n",
        ]
        .concat();
        assert_eq!(json(&pod_metrics_list_table(&list, &options)), want);
    }

    /// Swap becomes a column when the first row has it, as any usage key does in Go; a later
    /// row without it (a node without swap) shows Go's zero quantity, and the cells stay
    /// aligned with the columns.
    #[test]
    fn swap_is_a_column_when_the_first_row_has_it() {
        let options = TableOptions {
            include_object: IncludeObject::None,
            ..TableOptions::default()
        };
        let mut list = nodes();
        list.items[0] = list.items[0].clone().with_swap(Some(2 * MI));
        let text = json(&node_metrics_list_table(&list, &options));
        assert!(
            text.contains(r#"{"name":"swap","type":"string","format":"quantity","description":"","priority":0}"#),
            "{text}"
        );
        assert!(
            text.contains(r#"["node1","10m","5Mi","2Mi","1µs"]"#),
            "{text}"
        );
        assert!(
            text.contains(r#"["node2","1","1k","0","20.051s"]"#),
            "{text}"
        );
        // Without swap in the first row, no swap column, and no extra cell in any row.
        list.items.reverse();
        let text = json(&node_metrics_list_table(&list, &options));
        assert!(text.contains(COLUMNS), "{text}");
        assert!(text.contains(r#"["node1","10m","5Mi","1µs"]"#), "{text}");
        // Pods: a container's swap is summed like its memory.
        let mut pods = pods();
        pods.items[1].containers = pods.items[1]
            .containers
            .drain(..)
            .map(|c| c.with_swap(Some(MI)))
            .collect();
        pods.items.reverse();
        let text = json(&pod_metrics_list_table(&pods, &options));
        assert!(
            text.contains(r#"["pod2","20m","15Mi","2Mi","1m0.5s"]"#),
            "{text}"
        );
        assert!(text.contains(r#"["pod1","10m","5Mi","0","15s"]"#), "{text}");
    }

    #[test]
    fn empty_lists_give_null_columns_and_rows() {
        let options = TableOptions::default();
        let want = "{\"kind\":\"Table\",\"apiVersion\":\"meta.k8s.io/v1\",\"metadata\":{},\"columnDefinitions\":null,\"rows\":null}\n";
        assert_eq!(
            json(&node_metrics_list_table(
                &NodeMetricsList::new(MetricsVersion::V1beta1, Vec::new()),
                &options
            )),
            want
        );
        assert_eq!(
            json(&pod_metrics_list_table(
                &PodMetricsList::new(MetricsVersion::V1beta1, Vec::new()),
                &options
            )),
            want
        );
    }

    #[test]
    fn containerless_pods_reproduce_go_column_quirk() {
        let bare = |name: &str| {
            PodMetrics::new(
                "ns",
                name,
                BTreeMap::new(),
                created(),
                ts(),
                Duration::ZERO,
                Vec::new(),
            )
        };
        let full = PodMetrics::new(
            "ns",
            "full",
            BTreeMap::new(),
            created(),
            ts(),
            Duration::from_secs(10),
            vec![ContainerMetrics::new("c", 0, 2048)],
        );
        let options = TableOptions {
            include_object: IncludeObject::None,
            ..TableOptions::default()
        };
        let list = PodMetricsList::new(MetricsVersion::V1beta1, vec![bare("a"), full, bare("z")]);
        let want = [
            r#"{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{},"#,
            COLUMNS,
            r#""rows":["#,
            r#"{"cells":["a","0s"],"object":null},"#,
            r#"{"cells":["full","0","2Ki","10s"],"object":null},"#,
            r#"{"cells":["z","0","0","0s"],"object":null}]}"#,
            "\n",
        ]
        .concat();
        assert_eq!(json(&pod_metrics_list_table(&list, &options)), want);

        // Only container-less pods: Name and Window only.
        let list = PodMetricsList::new(MetricsVersion::V1beta1, vec![bare("a")]);
        assert_eq!(
            json(&pod_metrics_list_table(&list, &options)),
            concat!(
                r#"{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{},"#,
                r#""columnDefinitions":["#,
                r#"{"name":"Name","type":"string","format":"name","description":"Name of the resource","priority":0},"#,
                r#"{"name":"Window","type":"string","format":"duration","description":"","priority":0}],"#,
                r#""rows":[{"cells":["a","0s"],"object":null}]}"#,
                "\n"
            )
        );
    }

    #[test]
    fn table_metadata_copies_source_fields() {
        let mut list = nodes();
        list.metadata.resource_version = Some("7".into());
        list.metadata.continue_ = Some("token".into());
        list.metadata.remaining_item_count = Some(3);
        let table = node_metrics_list_table(&list, &TableOptions::default());
        assert_eq!(
            table.metadata,
            ListMeta {
                resource_version: Some("7".into()),
                continue_: Some("token".into()),
                ..ListMeta::default()
            }
        );
        let mut node = nodes().items.remove(0);
        node.metadata.resource_version = Some("9".into());
        let table = node_metrics_table(&node, &TableOptions::default());
        assert!(json(&table).starts_with(
            r#"{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"9"},"#
        ));
    }

    #[test]
    fn include_object_query_values() {
        assert_eq!(IncludeObject::from_query(None), Ok(IncludeObject::Metadata));
        assert_eq!(
            IncludeObject::from_query(Some("")),
            Ok(IncludeObject::Metadata)
        );
        assert_eq!(
            IncludeObject::from_query(Some("Metadata")),
            Ok(IncludeObject::Metadata)
        );
        assert_eq!(
            IncludeObject::from_query(Some("None")),
            Ok(IncludeObject::None)
        );
        assert_eq!(
            IncludeObject::from_query(Some("Object")),
            Ok(IncludeObject::Object)
        );
        match IncludeObject::from_query(Some("metadata")) {
            Err(status) => {
                assert_eq!(status.code(), 400);
                assert_eq!(
                    status.0.message.as_deref(),
                    Some(
                        "Unable to convert to Table as requested: includeObject: Invalid \
                         value: \"metadata\": must be 'Metadata', 'Object', 'None', or empty"
                    )
                );
            }
            Ok(other) => panic!("accepted {other:?}"),
        }
    }

    #[test]
    fn pretty_table() {
        let mut list = nodes();
        list.items.truncate(1);
        let options = TableOptions {
            include_object: IncludeObject::None,
            ..TableOptions::default()
        };
        let text = match encode_json_pretty(&node_metrics_list_table(&list, &options))
            .map(String::from_utf8)
        {
            Ok(Ok(text)) => text,
            other => panic!("encode failed: {other:?}"),
        };
        let want = r#"{
  "kind": "Table",
  "apiVersion": "meta.k8s.io/v1",
  "metadata": {},
  "columnDefinitions": [
    {
      "name": "Name",
      "type": "string",
      "format": "name",
      "description": "Name of the resource",
      "priority": 0
    },
    {
      "name": "cpu",
      "type": "string",
      "format": "quantity",
      "description": "",
      "priority": 0
    },
    {
      "name": "memory",
      "type": "string",
      "format": "quantity",
      "description": "",
      "priority": 0
    },
    {
      "name": "Window",
      "type": "string",
      "format": "duration",
      "description": "",
      "priority": 0
    }
  ],
  "rows": [
    {
      "cells": [
        "node1",
        "10m",
        "5Mi",
        "1µs"
      ],
      "object": null
    }
  ]
}"#;
        assert_eq!(text, want);
    }
}
