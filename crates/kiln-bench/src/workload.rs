//! What the scenarios run: the programs, the deterministic CSV of scenario B
//! with its expected answer, and the per-request random numbers of scenario D
//! with theirs. Pure functions, no IO, so the expected values are testable.

/// Scenarios A and C: Python hello world.
pub const PY_HELLO: &str = "print('hello')";
/// Scenario E: JavaScript hello world.
pub const JS_HELLO: &str = "console.log('hello')";
/// What both hello worlds print.
pub const HELLO_STDOUT: &str = "hello";

/// Scenario B: the file name the CSV is uploaded and staged under.
pub const CSV_NAME: &str = "data.csv";
/// Scenario B: the plot the script must produce.
pub const PLOT_NAME: &str = "plot.png";
/// Scenario B: rows in the CSV.
pub const CSV_ROWS: u64 = 1000;

/// Scenario B: the data-analysis script (pandas + matplotlib, saves a plot,
/// prints the total of the `sales` column).
pub const ANALYSIS_SCRIPT: &str = r#"import pandas as pd
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
df = pd.read_csv("data.csv")
df.plot(x="day", y="sales")
plt.savefig("plot.png")
print(df["sales"].sum())
"#;

/// Scenario P: the data run before a measured hello (pandas + matplotlib on
/// data built in the program, a plot saved, a deterministic total printed).
pub const DATA_RUN_SCRIPT: &str = r#"import pandas as pd
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
df = pd.DataFrame({"day": range(100), "sales": [(d * 37) % 101 for d in range(100)]})
df.plot(x="day", y="sales")
plt.savefig("trend.png")
print(int(df["sales"].sum()))
"#;
/// What [`DATA_RUN_SCRIPT`] prints.
pub const DATA_RUN_STDOUT: &str = "4986";

/// Scenario B2: typical analysis snippets (name, script, the file it must
/// write). Each prints a deterministic answer; Kiln's must equal the
/// baseline's. The data is generated or bundled (scikit-learn's iris): no
/// network.
pub const SNIPPETS: &[(&str, &str, Option<&str>)] = &[
    (
        "seaborn heatmap",
        r#"import numpy as np
import seaborn as sns
import matplotlib.pyplot as plt
data = (np.arange(144).reshape(12, 12) * 7) % 11
ax = sns.heatmap(data, annot=True, cmap="viridis")
ax.set_title("heatmap")
plt.savefig("heatmap.png")
print("cells", data.size, "sum", int(data.sum()))
"#,
        Some("heatmap.png"),
    ),
    (
        "sklearn random forest",
        r#"from sklearn.datasets import load_iris
from sklearn.ensemble import RandomForestClassifier
from sklearn.model_selection import train_test_split
X, y = load_iris(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.3, random_state=0)
clf = RandomForestClassifier(n_estimators=50, random_state=0).fit(X_train, y_train)
print(f"accuracy {clf.score(X_test, y_test):.3f}")
"#,
        None,
    ),
    (
        "statsmodels OLS",
        r#"import numpy as np
import statsmodels.api as sm
rng = np.random.default_rng(0)
x = rng.normal(size=200)
y = 2.0 * x + 1.0 + rng.normal(scale=0.5, size=200)
res = sm.OLS(y, sm.add_constant(x)).fit()
print(res.summary().tables[1])
print(f"r2 {res.rsquared:.4f}")
"#,
        None,
    ),
    (
        "scipy + sympy",
        r#"import numpy as np
import sympy as sp
from scipy import integrate, optimize
x = sp.symbols("x")
expr = sp.sin(x) ** 2
exact = sp.integrate(expr, (x, 0, sp.pi))
num, _ = integrate.quad(lambda t: np.sin(t) ** 2, 0, np.pi)
root = optimize.brentq(lambda t: t ** 3 - 2, 0, 2)
print(f"exact {exact} numeric {num:.6f} root {root:.6f}")
"#,
        None,
    ),
];

const REGIONS: [&str; 4] = ["north", "south", "east", "west"];

fn sales(day: u64) -> u64 {
    (day * 7919 + 13) % 1000
}

/// Scenario B: the CSV (header `day,sales,region`, [`CSV_ROWS`] rows),
/// identical on every call.
pub fn csv() -> String {
    let mut s = String::from("day,sales,region\n");
    for day in 0..CSV_ROWS {
        let region = REGIONS[(day % 4) as usize];
        s.push_str(&format!("{day},{},{region}\n", sales(day)));
    }
    s
}

/// Scenario B: what [`ANALYSIS_SCRIPT`] prints for [`csv`].
pub fn csv_expected_sum() -> u64 {
    (0..CSV_ROWS).map(sales).sum()
}

/// Scenario D: the file each request uploads.
pub const NUMBERS_NAME: &str = "numbers.txt";
/// Scenario D: the program that reads it and prints the sum.
pub const SUM_SCRIPT: &str =
    "print(sum(int(line) for line in open('numbers.txt') if line.strip()))";
/// Scenario D: numbers per uploaded file.
pub const NUMBERS_PER_FILE: usize = 10;

/// SplitMix64: a tiny, well-mixed generator, good enough to make every
/// request's payload different (not for anything secret).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator for one request, mixing the run's seed with its position.
    pub fn for_request(seed: u64, run: usize, user: usize, request: usize) -> SplitMix64 {
        let mut g = SplitMix64(seed);
        let salt = g.next_u64() ^ ((run as u64) << 48) ^ ((user as u64) << 24) ^ (request as u64);
        SplitMix64(salt)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Scenario D: one request's file contents and the sum the program must print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Numbers {
    pub contents: String,
    pub expected: u64,
}

/// [`NUMBERS_PER_FILE`] random numbers below one billion, one per line.
pub fn numbers(rng: &mut SplitMix64) -> Numbers {
    let mut contents = String::new();
    let mut expected = 0u64;
    for _ in 0..NUMBERS_PER_FILE {
        let n = rng.next_u64() % 1_000_000_000;
        expected += n;
        contents.push_str(&format!("{n}\n"));
    }
    Numbers { contents, expected }
}

/// S, stateful: request `i` of a user builds on the state the previous
/// ones left in the live kernel (a counter, a growing list, a DataFrame
/// with one row per request) and prints what [`stateful_expected`] says.
pub fn stateful_step(i: usize) -> String {
    if i == 0 {
        "import pandas as pd\ncounter = 1\nitems = [0]\ndf = pd.DataFrame({'n': [0]})\nprint(counter, len(items), int(df['n'].sum()))".to_owned()
    } else {
        format!(
            "counter += 1\nitems.append({i})\ndf.loc[len(df)] = [{i}]\nprint(counter, len(items), int(df['n'].sum()))"
        )
    }
}

/// S, the same request as a one-shot program: it rebuilds the state the
/// stateful request found, then prints the same line.
pub fn stateless_step(i: usize) -> String {
    let n = i + 1;
    format!(
        "import pandas as pd\ncounter = {n}\nitems = list(range({n}))\ndf = pd.DataFrame({{'n': items}})\nprint(counter, len(items), int(df['n'].sum()))"
    )
}

/// S: what request `i` prints.
pub fn stateful_expected(i: usize) -> String {
    let n = i as u64 + 1;
    format!("{n} {n} {}", n * (n - 1) / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_is_deterministic_with_header_and_all_rows() {
        let a = csv();
        assert_eq!(a, csv());
        let lines: Vec<&str> = a.lines().collect();
        assert_eq!(lines.len() as u64, CSV_ROWS + 1);
        assert_eq!(lines[0], "day,sales,region");
        assert_eq!(lines[1], "0,13,north");
        assert_eq!(lines[2], "1,932,south");
    }

    #[test]
    fn expected_sum_matches_the_sales_column_of_the_csv() {
        let parsed: u64 = csv()
            .lines()
            .skip(1)
            .map(|l| {
                l.split(',')
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(u64::MAX / 2000)
            })
            .sum();
        assert_eq!(parsed, csv_expected_sum());
    }

    #[test]
    fn every_request_gets_different_numbers_and_their_sum() {
        let seed = 42;
        let a = numbers(&mut SplitMix64::for_request(seed, 0, 0, 0));
        let b = numbers(&mut SplitMix64::for_request(seed, 0, 0, 1));
        let c = numbers(&mut SplitMix64::for_request(seed, 0, 1, 0));
        let d = numbers(&mut SplitMix64::for_request(seed, 1, 0, 0));
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
        assert_eq!(a, numbers(&mut SplitMix64::for_request(seed, 0, 0, 0)));
        let lines: Vec<u64> = a.contents.lines().map(|l| l.parse().unwrap()).collect();
        assert_eq!(lines.len(), NUMBERS_PER_FILE);
        assert!(lines.iter().all(|n| *n < 1_000_000_000));
        assert_eq!(lines.iter().sum::<u64>(), a.expected);
    }
}
