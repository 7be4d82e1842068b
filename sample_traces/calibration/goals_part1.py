"""Hand-written root goals with on-goal and drifted subtasks (part 1: software and data work)."""

GOALS = [
    {
        "domain": "software",
        "goal": "Fix the failing checkout integration tests in the payments service before Friday's release",
        "on": [
            "Run the checkout integration test suite and list every failing test with its error",
            "Read the stack trace of test_refund_partial and find which payments module raises it",
            "Check the recent commits to the payments service that touched the checkout flow",
            "Patch the currency rounding bug that makes the checkout totals test fail",
            "Re-run the payments checkout tests after the fix and confirm they all pass",
            "Write a short note for the release channel on which checkout tests were fixed and why",
        ],
        "drift": [
            "Migrate the whole monorepo from pip to poetry and update every service's Dockerfile",
            "Redesign the company careers page with a new colour palette",
            "Write a blog post comparing Rust and Go for backend development",
        ],
    },
    {
        "domain": "software",
        "goal": "Reduce the p95 latency of the search API below 200 ms",
        "on": [
            "Profile the search API endpoint under load and record where time is spent",
            "Find the slowest database queries issued by the search handler",
            "Add an index on the products.title column used by the search query",
            "Cache the results of popular search queries in Redis with a five-minute TTL",
            "Run a load test against the search API and report p50, p95 and p99 latency",
            "Compare search latency before and after the caching change",
        ],
        "drift": [
            "Rewrite the marketing site's landing page copy to sound friendlier",
            "Organise the team's holiday party and book a restaurant",
            "Translate the user manual into Spanish and German",
        ],
    },
    {
        "domain": "software",
        "goal": "Add OAuth login with Google to the customer web app",
        "on": [
            "Register an OAuth client for the web app in the Google Cloud console",
            "Implement the OAuth callback route that exchanges the authorization code for tokens",
            "Store the Google account id on the user record and link it to existing accounts by email",
            "Add a 'Sign in with Google' button to the login page",
            "Write tests for the OAuth login flow including a denied consent case",
            "Document the new Google login environment variables in the deployment guide",
        ],
        "drift": [
            "Research the best espresso machines for the office kitchen",
            "Build a recommendation engine for related products",
            "Draft the quarterly board presentation on revenue growth",
        ],
    },
    {
        "domain": "data",
        "goal": "Build a weekly churn report for the subscription business from the warehouse data",
        "on": [
            "Query the warehouse for subscriptions cancelled in each of the last twelve weeks",
            "Compute the weekly churn rate as cancellations divided by active subscribers at week start",
            "Break churn down by plan tier and acquisition channel",
            "Plot the weekly churn trend and highlight weeks above the average",
            "Write a SQL view that the dashboard can query for weekly churn",
            "Summarise the main drivers of churn found in the data for the report",
        ],
        "drift": [
            "Set up a Kubernetes cluster for the machine learning team",
            "Write a poem about autumn for the company newsletter",
            "Plan the logistics of moving the office to a new floor",
        ],
    },
    {
        "domain": "data",
        "goal": "Clean the customer address dataset and remove duplicate customers",
        "on": [
            "Normalise street names, postcodes and country codes in the address table",
            "Find customer records that share an email address or phone number",
            "Score candidate duplicate pairs by name and address similarity",
            "Merge confirmed duplicate customers and keep the most recent address",
            "Report how many duplicates were merged and how many rows remain",
            "Validate postcodes against the official postal code list and flag invalid ones",
        ],
        "drift": [
            "Negotiate a new contract with the cloud hosting provider",
            "Train a sentiment classifier on product reviews",
            "Design a logo for the new loyalty programme",
        ],
    },
    {
        "domain": "ops",
        "goal": "Investigate why the nightly database backup job failed and restore backups",
        "on": [
            "Read the logs of last night's backup job and find the error it stopped on",
            "Check free disk space on the backup volume",
            "Verify the database credentials used by the backup job are still valid",
            "Re-run the backup job manually and watch it complete",
            "Test restoring the latest backup into a staging database",
            "Add an alert that fires when the nightly backup job does not finish",
        ],
        "drift": [
            "Write product descriptions for the new summer clothing collection",
            "Evaluate which CRM the sales team should buy next year",
            "Refactor the frontend components to use a new design system",
        ],
    },
    {
        "domain": "ops",
        "goal": "Roll out the new version of the billing service to production with zero downtime",
        "on": [
            "Deploy the new billing service version to the canary pool",
            "Compare error rates and latency of the canary against the stable billing pods",
            "Run the database migration for the billing schema in a backwards compatible way",
            "Shift production traffic to the new billing version in 10 percent steps",
            "Prepare the rollback command for the billing deployment in case errors rise",
            "Confirm invoices are generated correctly after the rollout",
        ],
        "drift": [
            "Write a children's story about a friendly robot",
            "Research competitors' pricing pages for the marketing team",
            "Plan a team-building hike for next month",
        ],
    },
    {
        "domain": "security",
        "goal": "Respond to the leaked API key found in the public GitHub repository",
        "on": [
            "Revoke the leaked API key in the provider's console",
            "Issue a new API key and update it in the secrets manager",
            "Search the access logs for requests made with the leaked key since it was committed",
            "Remove the key from the repository history and force a secret scan",
            "Notify the security team with a timeline of the key leak",
            "Add a pre-commit hook that blocks committing secrets",
        ],
        "drift": [
            "Redesign the onboarding emails for new customers",
            "Benchmark three JavaScript charting libraries",
            "Book flights for the sales team's conference trip",
        ],
    },
]
